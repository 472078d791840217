// test-labels: unit concurrency
// The router's choices (router.h) without sockets: which replica each policy picks from the
// same views, that unhealthy replicas and replicas without the model are never picked, ties
// spread, and replica URLs are validated.
#include "chorus/router/router.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace chorus::router {
namespace {

ReplicaView V(int64_t in_flight, bool healthy = true, bool serves = true, int64_t ranks = 0,
              bool runs = false) {
  return ReplicaView{.healthy = healthy,
                     .serves_model = serves,
                     .in_flight = in_flight,
                     .rank_in_flight = ranks,
                     .runs_variant = runs};
}

TEST(RouterChoiceTest, NeverPicksAnUnhealthyReplicaOrOneWithoutTheModel) {
  const std::vector<ReplicaView> v = {V(0, false), V(5), V(0, true, false)};
  for (Policy p : {Policy::kLeastLoaded, Policy::kRandom, Policy::kPack, Policy::kRankAware})
    for (uint64_t r = 0; r < 20; ++r) EXPECT_EQ(ChooseReplica(p, v, 32, r), 1) << PolicyName(p);
  const std::vector<ReplicaView> none = {V(0, false), V(0, true, false)};
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, none, 32, 0), -1);
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, {}, 32, 0), -1);
}

TEST(RouterChoiceTest, LeastLoadedPicksTheFewestInFlightAndSpreadsTies) {
  EXPECT_EQ(ChooseReplica(Policy::kLeastLoaded, std::vector{V(3), V(1), V(2)}, 32, 7), 1);
  std::set<int> picked;
  for (uint64_t r = 0; r < 16; ++r)
    picked.insert(ChooseReplica(Policy::kLeastLoaded, std::vector{V(2), V(2), V(2)}, 32, r));
  EXPECT_EQ(picked.size(), 3u);
}

TEST(RouterChoiceTest, PackFillsTheBusiestReplicaWithRoomFirst) {
  // Punica's consolidation: 5 in flight, capacity 8 → stay on it rather than wake an idle one.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(0), V(5), V(2)}, 8, 0), 1);
  // Full (8 of 8): the next busiest with room.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(0), V(8), V(2)}, 8, 0), 2);
  // All full: the least loaded.
  EXPECT_EQ(ChooseReplica(Policy::kPack, std::vector{V(9), V(8), V(10)}, 8, 0), 1);
}

TEST(RouterChoiceTest, RankAwareWeighsTheRanksInFlightAndTheVariantAlreadyRunning) {
  // Equal rows, but replica 0 runs rank-64 adapters on all of them: replica 1 is cheaper.
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{V(4, true, true, 256), V(4)}, 32, 0), 1);
  // Equal load: the replica already running the variant (no new segment, no load).
  EXPECT_EQ(ChooseReplica(Policy::kRankAware, std::vector{V(2), V(2, true, true, 0, /*runs=*/true)},
                          32, 0),
            1);
}

TEST(RouterChoiceTest, RandomSpreadsOverAllCandidates) {
  std::set<int> picked;
  for (uint64_t r = 0; r < 64; ++r)
    picked.insert(ChooseReplica(Policy::kRandom, std::vector{V(9), V(0), V(4)}, 32, r));
  EXPECT_EQ(picked.size(), 3u);
}

TEST(RouterOptionsTest, ReplicaUrlsAndPoliciesAreValidated) {
  auto a = ParseReplicaUrl("http://127.0.0.1:8001/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8001);
  EXPECT_EQ(ParseReplicaUrl("http://[::1]:9000")->host, "::1");
  for (const char* bad : {"127.0.0.1:8001", "https://h:1", "http://h", "http://h:0",
                          "http://h:70000", "http://h:80/v1", "http://:80"}) {
    auto r = ParseReplicaUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("replica"), std::string::npos);
    }
  }
  EXPECT_FALSE(ParsePolicy("fastest").ok());
  EXPECT_EQ(*ParsePolicy("pack"), Policy::kPack);
  EXPECT_FALSE(Router::Create(RouterOptions{}).ok());  // no replica
  RouterOptions twice;
  twice.replicas = {"http://a:1", "http://a:1/"};
  auto r = Router::Create(twice);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace chorus::router
